"""Renderers: terminal (rich), JSON and HTML (plotly). They format result objects only."""
