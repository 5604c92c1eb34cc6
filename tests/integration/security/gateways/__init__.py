"""What a gateway's credentials reach, tried as an attacker would: its own login and nkey
against other gateways, nodes it never held, forged and stale facts, the Hello's proof."""
