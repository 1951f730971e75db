"""Exercise 4, a solution: back off on an overflow, grow after growth_interval finite steps."""


def update_scale(scale, growth_tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
    """One step of PyTorch's dynamic loss-scale schedule."""
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        return scale * growth_factor, 0
    return scale, growth_tracker
