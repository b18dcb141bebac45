"""Training with Lightning: the LightningModule and DataModule around a Task, token batching,
the resumable loader, optimiser and schedules, the Trainer, checkpoints, train/eval runs and
inference."""
