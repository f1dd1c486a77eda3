"""Drafter weights and their formats: draft folders, Medusa heads, EAGLE/EAGLE-3 predictors."""
