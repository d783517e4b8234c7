"""Long-context accuracy of the sparse modes: RULER-style tasks generated in code, and perplexity."""
