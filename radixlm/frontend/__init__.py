"""HTTP server: OpenAI-compatible and native routes (`create_app` in app.py)."""
