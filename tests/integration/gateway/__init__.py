"""The reference gateway on real servers: admission, the Hello transaction, sessions."""
