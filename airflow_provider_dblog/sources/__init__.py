"""Sources: what differs between databases lives in each source's package."""
