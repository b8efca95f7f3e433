"""Wire formats: each protocol decodes a request into named numpy arrays and encodes outputs back."""
