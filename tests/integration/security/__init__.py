"""Trust boundaries tried as the principal they limit: bus principals, database roles,
facts from a gateway that does not hold the node."""
