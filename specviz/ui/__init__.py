"""The web UI: HTML rendering (render), figures (charts), run state (state),
background model loading (loader) and the Gradio page (blocks).

Only render is imported here; blocks needs gradio, charts needs plotly."""
from .render import esc, legend_html, page_css

__all__ = ["esc", "legend_html", "page_css"]
