"""`bench sweep`: method x k x load, one engine setting at a time (run), the deployers that bring
each setting up, what the measurements say (analysis) and the pictures (plots)."""
