"""Reaching the servers: a database away, refusing, hanging or coming up is waited on to
the bound; a setting that can never work (a TLS file, a CA, a password) is one line at
once; the workers at sslmode=verify-full against a PostgreSQL with TLS on."""
