"""What runs on each side and why: precision timings per machine, self-speculative settings."""
