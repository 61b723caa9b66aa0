// Placeholder: filled by the normalization part of issue 15.
