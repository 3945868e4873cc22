"""A run's sharded DCP checkpoints (`checkpointer`, `state`): saving, resuming, reading the spec a
checkpoint was written with. Imports no model: what turns a checkpoint into weights for another
use lives beside the models (`trainer.models.init_from`, a run's starting weights) and the
end-of-run exports (`trainer.exports`)."""
