"""The model core, torch only: relation-aware attention, position schemes, the Transformer,
decoding and the loss. Lift it into any training loop; nothing here knows about Lightning."""
