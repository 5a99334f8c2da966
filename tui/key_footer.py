"""The keys along the bottom: Textual's footer, built again only when the keys it
shows change. Textual's own builds a widget per key at every change of focus,
even to a widget that offers the same keys: at 1,024 ranks that was half of
what the UI thread did for a key press (benchmarks/tui_refresh.py)."""
from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


def shown_keys(screen: Screen) -> tuple:
    """What the footer draws of the screen's active bindings."""
    return tuple((binding.key, binding.description, binding.action, enabled, tooltip)
                 for _, binding, enabled, tooltip in screen.active_bindings.values()
                 if binding.show)


class KeyFooter(Footer):
    def __init__(self, **options) -> None:
        super().__init__(**options)
        self.built_for: tuple | None = None

    def bindings_changed(self, screen: Screen) -> None:
        keys = shown_keys(screen)
        if keys == self.built_for:
            return
        if screen.app.app_focus:  # Footer builds nothing while the app is out of focus
            self.built_for = keys
        super().bindings_changed(screen)
