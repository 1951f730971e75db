"""Exercise 4: write the dynamic loss-scale schedule.

A dynamic loss scaler (lesson 5; ``miniflow.amp.GradScaler``, PyTorch's ``GradScaler``) changes the
scale after every step. If the step's gradients held an inf or NaN (``found_inf``), the step was
skipped and the scale was too large: multiply it by ``backoff_factor`` and restart counting.
Otherwise count the step in ``growth_tracker``; after ``growth_interval`` finite steps in a row,
multiply the scale by ``growth_factor`` and restart counting.

Check it:  python -m miniflow.exercises check 4
"""


def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
    """One step of the schedule.

    Args:
        scale: the current loss scale (a float > 0).
        growth_tracker: finite steps in a row so far (an int >= 0).
        found_inf: whether this step's gradients held an inf or NaN (a bool).
        growth_factor, backoff_factor, growth_interval: PyTorch's ``GradScaler`` arguments.

    Returns:
        ``(new_scale, new_growth_tracker)``.
    """
    raise NotImplementedError
