"""How batches cross process hops: object-store references, the numpy wire format and the
packed <-> dense token layouts."""
