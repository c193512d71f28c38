"""For users of the batch ring: the batch client and the tf.data adapter."""
