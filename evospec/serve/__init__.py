"""An OpenAI-compatible HTTP server over one TextGenerator (app.py), its metrics and its durable state.

The package itself imports nothing, so that the CLI reads `evospec.serve.config` without loading the web stack.
"""
