// Placeholder of the parameter-server seam (issue 13): filled in by its part.
