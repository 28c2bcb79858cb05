"""Where SpecViz runs: Hugging Face Spaces (spaces.py), GPUs (gpu.py, bandwidth.py).
No gradio or torch imports at module level: the CLI and the page pick from here."""
