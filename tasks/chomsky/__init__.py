"""The tasks of Delétang et al. (2023), "Neural Networks and the Chomsky Hierarchy", one module per
level of the hierarchy: regular.py, context_free.py (deterministic context-free) and
context_sensitive.py, over the shared generator and score of base.py."""
