"""The input pipeline: in-memory arrays (`data`) and streamed sources (`streams`: a tf.data
callable, files), each split per replica and positioned at the resumed step."""
