"""Other engines than ours that produce the same events (engine/events.py), so
the UI, CLI and bench consume them unchanged. vllm.py: a vLLM server."""
