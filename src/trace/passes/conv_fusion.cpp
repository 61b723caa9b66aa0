// Placeholder: filled by the demo part of issue 15 (conv + bias + relu; batch norm folded into
// the convolution in inference graphs).
