"""Training drafters for a target by self-distillation: the shared toolkit (`common`), the draft model
(`draft`), Medusa heads (`medusa`) and EAGLE/EAGLE-3 predictors (`eagle`); the commands are `specdec train ...`
(`specdec.cli.train`)."""
