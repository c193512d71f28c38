"""The PyTorch example trainer: the model process of `ringfeed run CONFIG --trainer torch`."""
