"""The public API: worker classes and the app, the composition root that wires the rest."""
