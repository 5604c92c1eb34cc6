"""The five workers' rules on real servers, one worker at a time (and clones across two)."""
