// The work of one engine step as the planner's performance model counts it
// (planner/perf_model.h's StepLoad is this type), and a step as a worker
// measured it: its work and its duration, what the planner fits its
// hardware profile to (planner/fit.h).
#pragma once

namespace tandem::runtime {

struct StepShape {
  double prefill_tokens = 0;
  double prefill_ctx = 0;   // sum over prompt tokens of the positions each attends to
  double decode_seqs = 0;
  double decode_ctx = 0;    // sum over decoding sequences of their context
  double logit_rows = 0;    // rows that need the LM head (decoding sequences and finished prompts)
};

struct StepSample {
  StepShape shape;
  double seconds = 0;
};

}  // namespace tandem::runtime
