"""Training for drafters: self-distillation of a small draft model (`draft_distill`), exposed as
`specdec train ...` (`cli.train_app`)."""
