"""The bench suite behind `specdec bench` (scripts in the repository's bench/ import it)."""
