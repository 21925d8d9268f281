"""A Keras `model.fit` script under MirroredStrategy: runs as `python -m fit_example.train`,
under `pinpoint trace`, and as a Pinpoint train step (`train.entrypoint`)."""
