"""A small CNN on the 8x8 digits Pinpoint ships: the worked example of Pinpoint's user-code contract.

`digits_cnn.model:build_model` is the model callable, `digits_cnn.data` writes the TFRecords
(`python -m digits_cnn.data OUT_DIR`) and `digits_cnn.data:dataset` reads them back.
"""
