"""Token trees: the tree itself, tree specs, and the one tree builder every drafter uses."""
