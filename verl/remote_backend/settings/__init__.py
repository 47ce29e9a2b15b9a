"""How settings are read: the one typed loader, and the values every backend reads from verl's
own config."""
