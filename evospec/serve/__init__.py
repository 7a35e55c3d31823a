"""An OpenAI-compatible HTTP server over one TextGenerator (app.py), or over engine replicas on Ray Serve
that share one learner (cluster.py, sharing.py); its metrics and its durable state.

The package itself imports nothing, so that the CLI reads `evospec.serve.config` without loading the web
stack, and a server of one process never imports Ray.
"""
