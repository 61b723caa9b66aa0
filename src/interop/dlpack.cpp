// Placeholder: filled by the DLPack part of issue 15.
