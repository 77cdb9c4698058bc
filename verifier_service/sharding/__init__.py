"""A model sharded over tensor-parallel ranks: the split, the sharded layers and model, and the collectives that
join them (the floor below the model runner; the rank processes that run it are verifier_service/parallel/)."""
