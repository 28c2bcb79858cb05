"""The web UI: HTML rendering (render), figures (charts), run state (state),
background model loading (loader) and the Gradio page (blocks).

Only render/state/charts are imported eagerly; blocks needs gradio."""
from .render import esc, legend_html, page_css  # noqa: F401
