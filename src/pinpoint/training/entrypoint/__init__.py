"""`train.entrypoint`: the user's own training function as the train step (`context`: the
EntrypointContext it is handed; `fit_checkpoint`: model.fit's resuming checkpoints)."""
