"""HTTP server: OpenAI-compatible and native routes. Built in a later issue."""
