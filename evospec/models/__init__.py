"""Causal LMs: the pinned zoo and loading by alias, directory, GGUF file or hub id."""
