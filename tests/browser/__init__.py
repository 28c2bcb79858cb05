"""Helpers shared by tests/test_app.py and tests/test_browser.py."""
