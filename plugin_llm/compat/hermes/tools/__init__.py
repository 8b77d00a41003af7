"""``tools``: the Hermes tool helpers plugins import."""
