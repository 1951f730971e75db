"""Graph passes: each ``def name(graph, ctx) -> graph`` in its own module; ``pipeline.py`` orders them."""
