"""The engine: one step of continuous batching with speculation (engine.py), and its parts."""
