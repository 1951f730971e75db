"""Runtime: backend selection, plan building and execution, eager op execution."""
