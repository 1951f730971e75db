"""Exercise 2, a solution: the matmul is white, the exp-sum black, the layout op clear, the
elementwise arithmetic gray."""


def amp_lists():
    """Each new op's AMP list."""
    return {"exercise2_scaled_matmul": "white", "exercise2_logsumexp": "black",
            "exercise2_flip": "clear", "exercise2_scale_shift": "gray"}
