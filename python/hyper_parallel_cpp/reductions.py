"""A loss's reduction by name, as every front end (torch's and MindSpore's) hands it to the kernels:
ATen's codes, which the C library's hpk_reduction repeats (none 0, mean 1, sum 2). The kernels see
only the code, so the name is checked here, once. Needs neither torch nor MindSpore."""

REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def reduction_code(reduction: str, op: str) -> int:
    """The kernels' code for a reduction name, or ValueError naming the names expected."""
    try:
        return REDUCTIONS[reduction]
    except (KeyError, TypeError):
        raise ValueError(f"{op}: reduction must be one of 'none', 'mean', 'sum', got {reduction!r}") from None


__all__ = ["REDUCTIONS", "reduction_code"]
