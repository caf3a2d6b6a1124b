#include "common/proto_convert.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/names.h"

namespace shardopt {

absl::StatusOr<DType> DTypeFromProto(v1::DType proto) {
  switch (proto) {
    case v1::DTYPE_UNSPECIFIED:
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown dtype ", static_cast<int>(proto)));
  }
}

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<LrSchedule> LrScheduleFromProto(const v1::LrSchedule& proto) {
  LrSchedule s;
  switch (proto.kind()) {
    case v1::LrSchedule::LR_SCHEDULE_CONSTANT:
      s.kind = LrSchedule::Kind::kConstant;
      break;
    case v1::LrSchedule::LR_SCHEDULE_WARMUP:
      s.kind = LrSchedule::Kind::kWarmup;
      break;
    case v1::LrSchedule::LR_SCHEDULE_WARMUP_LINEAR_DECAY:
      s.kind = LrSchedule::Kind::kWarmupLinearDecay;
      break;
    case v1::LrSchedule::LR_SCHEDULE_WARMUP_COSINE:
      s.kind = LrSchedule::Kind::kWarmupCosine;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown lr schedule kind ", static_cast<int>(proto.kind())));
  }
  switch (proto.warmup_type()) {
    case v1::LrSchedule::WARMUP_LINEAR:
      s.warmup_type = LrSchedule::WarmupType::kLinear;
      break;
    case v1::LrSchedule::WARMUP_LOG:
      s.warmup_type = LrSchedule::WarmupType::kLog;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown warmup type ", static_cast<int>(proto.warmup_type())));
  }
  s.warmup_steps = proto.warmup_steps();
  s.warmup_start_lr = proto.warmup_start_lr();
  s.total_steps = proto.total_steps();
  s.min_lr = proto.min_lr();
  if (absl::Status status = s.Validate(); !status.ok()) return status;
  return s;
}

v1::LrSchedule LrScheduleToProto(const LrSchedule& s) {
  v1::LrSchedule proto;
  const v1::LrSchedule::Kind kinds[] = {
      v1::LrSchedule::LR_SCHEDULE_CONSTANT, v1::LrSchedule::LR_SCHEDULE_WARMUP,
      v1::LrSchedule::LR_SCHEDULE_WARMUP_LINEAR_DECAY, v1::LrSchedule::LR_SCHEDULE_WARMUP_COSINE};
  proto.set_kind(kinds[static_cast<int>(s.kind)]);
  proto.set_warmup_type(s.warmup_type == LrSchedule::WarmupType::kLog
                            ? v1::LrSchedule::WARMUP_LOG
                            : v1::LrSchedule::WARMUP_LINEAR);
  proto.set_warmup_steps(s.warmup_steps);
  proto.set_warmup_start_lr(s.warmup_start_lr);
  proto.set_total_steps(s.total_steps);
  proto.set_min_lr(s.min_lr);
  return proto;
}

absl::StatusOr<ModelLayout> LayoutFromProto(const v1::Layout& proto, uint32_t shard_count) {
  std::vector<TensorSpec> specs;
  specs.reserve(proto.tensors_size());
  for (const v1::TensorSpec& t : proto.tensors()) {
    absl::StatusOr<DType> dtype = DTypeFromProto(t.dtype());
    if (!dtype.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor ", Quoted(t.name()), ": ", dtype.status().message()));
    }
    specs.push_back(TensorSpec{t.name(), {t.shape().begin(), t.shape().end()}, *dtype});
  }
  Partition partition;
  switch (proto.partition()) {
    case v1::PARTITION_FLAT:
      partition = Partition::kFlat;
      break;
    case v1::PARTITION_WHOLE_TENSORS:
      partition = Partition::kWholeTensors;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown partition ", static_cast<int>(proto.partition())));
  }
  return ModelLayout::Create(std::move(specs), proto.alignment(), shard_count, partition);
}

v1::Layout LayoutToProto(const ModelLayout& layout) {
  v1::Layout proto;
  proto.set_alignment(layout.alignment());
  proto.set_partition(layout.partition() == Partition::kWholeTensors ? v1::PARTITION_WHOLE_TENSORS
                                                                     : v1::PARTITION_FLAT);
  for (const TensorPlacement& t : layout.tensors()) {
    v1::TensorSpec* spec = proto.add_tensors();
    spec->set_name(t.spec.name);
    for (int64_t d : t.spec.shape) spec->add_shape(d);
    spec->set_dtype(DTypeToProto(t.spec.dtype));
  }
  return proto;
}

absl::StatusOr<OptimizerConfig> OptimizerConfigFromProto(const v1::OptimizerConfig& proto) {
  OptimizerConfig c;
  switch (proto.kind_case()) {
    case v1::OptimizerConfig::kSgd: {
      const v1::SgdConfig& s = proto.sgd();
      c.kind = OptimizerKind::kSgd;
      c.lr = s.lr();
      c.momentum = s.momentum();
      c.dampening = s.dampening();
      c.nesterov = s.nesterov();
      c.weight_decay = s.weight_decay();
      c.maximize = s.maximize();
      break;
    }
    case v1::OptimizerConfig::kAdam:
    case v1::OptimizerConfig::kAdamw: {
      const bool decoupled = proto.kind_case() == v1::OptimizerConfig::kAdamw;
      const v1::AdamConfig& a = decoupled ? proto.adamw() : proto.adam();
      c.kind = decoupled ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
      c.lr = a.lr();
      c.beta1 = a.beta1();
      c.beta2 = a.beta2();
      c.eps = a.eps();
      c.weight_decay = a.weight_decay();
      c.amsgrad = a.amsgrad();
      c.maximize = a.maximize();
      break;
    }
    case v1::OptimizerConfig::kAdagrad: {
      const v1::AdagradConfig& a = proto.adagrad();
      c.kind = OptimizerKind::kAdagrad;
      c.lr = a.lr();
      c.lr_decay = a.lr_decay();
      c.weight_decay = a.weight_decay();
      c.initial_accumulator_value = a.initial_accumulator_value();
      c.eps = a.eps();
      c.maximize = a.maximize();
      break;
    }
    case v1::OptimizerConfig::kLion: {
      const v1::LionConfig& l = proto.lion();
      c.kind = OptimizerKind::kLion;
      c.lr = l.lr();
      c.beta1 = l.beta1();
      c.beta2 = l.beta2();
      c.weight_decay = l.weight_decay();
      c.maximize = l.maximize();
      break;
    }
    case v1::OptimizerConfig::kLamb: {
      const v1::LambConfig& l = proto.lamb();
      c.kind = OptimizerKind::kLamb;
      c.lr = l.lr();
      c.beta1 = l.beta1();
      c.beta2 = l.beta2();
      c.eps = l.eps();
      c.weight_decay = l.weight_decay();
      c.min_trust_ratio = l.min_trust_ratio();
      c.max_trust_ratio = l.max_trust_ratio();
      c.bias_correction = !l.disable_bias_correction();
      c.maximize = l.maximize();
      break;
    }
    case v1::OptimizerConfig::kAdafactor: {
      const v1::AdafactorConfig& a = proto.adafactor();
      c.kind = OptimizerKind::kAdafactor;
      c.lr = a.lr();
      c.beta2_decay = a.beta2_decay();
      c.eps1 = a.eps1() < 0 ? -1.0 : a.eps1();
      c.eps2 = a.eps2();
      c.clip_threshold = a.clip_threshold();
      c.weight_decay = a.weight_decay();
      c.maximize = a.maximize();
      break;
    }
    case v1::OptimizerConfig::kMuon: {
      const v1::MuonConfig& m = proto.muon();
      c.kind = OptimizerKind::kMuon;
      c.lr = m.lr();
      c.weight_decay = m.weight_decay();
      c.momentum = m.momentum();
      c.nesterov = !m.disable_nesterov();
      c.ns_a = m.ns_a();
      c.ns_b = m.ns_b();
      c.ns_c = m.ns_c();
      c.ns_steps = m.ns_steps();
      c.eps = m.eps();
      switch (m.adjust_lr()) {
        case v1::MUON_ADJUST_LR_ORIGINAL:
          c.adjust_lr = MuonAdjustLr::kOriginal;
          break;
        case v1::MUON_ADJUST_LR_MATCH_RMS_ADAMW:
          c.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
          break;
        default:
          return absl::InvalidArgumentError(
              absl::StrCat("unknown Muon adjust_lr ", static_cast<int>(m.adjust_lr())));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError("no optimizer set in OptimizerConfig");
  }
  if (absl::Status s = c.Validate(); !s.ok()) return s;
  return c;
}

v1::OptimizerConfig OptimizerConfigToProto(const OptimizerConfig& c) {
  v1::OptimizerConfig proto;
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      v1::SgdConfig* s = proto.mutable_sgd();
      s->set_lr(c.lr);
      s->set_momentum(c.momentum);
      s->set_dampening(c.dampening);
      s->set_nesterov(c.nesterov);
      s->set_weight_decay(c.weight_decay);
      s->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      v1::AdamConfig* a =
          c.kind == OptimizerKind::kAdam ? proto.mutable_adam() : proto.mutable_adamw();
      a->set_lr(c.lr);
      a->set_beta1(c.beta1);
      a->set_beta2(c.beta2);
      a->set_eps(c.eps);
      a->set_weight_decay(c.weight_decay);
      a->set_amsgrad(c.amsgrad);
      a->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kAdagrad: {
      v1::AdagradConfig* a = proto.mutable_adagrad();
      a->set_lr(c.lr);
      a->set_lr_decay(c.lr_decay);
      a->set_weight_decay(c.weight_decay);
      a->set_initial_accumulator_value(c.initial_accumulator_value);
      a->set_eps(c.eps);
      a->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kLion: {
      v1::LionConfig* l = proto.mutable_lion();
      l->set_lr(c.lr);
      l->set_beta1(c.beta1);
      l->set_beta2(c.beta2);
      l->set_weight_decay(c.weight_decay);
      l->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kLamb: {
      v1::LambConfig* l = proto.mutable_lamb();
      l->set_lr(c.lr);
      l->set_beta1(c.beta1);
      l->set_beta2(c.beta2);
      l->set_eps(c.eps);
      l->set_weight_decay(c.weight_decay);
      l->set_min_trust_ratio(c.min_trust_ratio);
      l->set_max_trust_ratio(c.max_trust_ratio);
      l->set_disable_bias_correction(!c.bias_correction);
      l->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kAdafactor: {
      v1::AdafactorConfig* a = proto.mutable_adafactor();
      a->set_lr(c.lr);
      a->set_beta2_decay(c.beta2_decay);
      a->set_eps1(c.eps1 < 0 ? -1.0 : c.eps1);
      a->set_eps2(c.eps2);
      a->set_clip_threshold(c.clip_threshold);
      a->set_weight_decay(c.weight_decay);
      a->set_maximize(c.maximize);
      break;
    }
    case OptimizerKind::kMuon: {
      v1::MuonConfig* m = proto.mutable_muon();
      m->set_lr(c.lr);
      m->set_weight_decay(c.weight_decay);
      m->set_momentum(c.momentum);
      m->set_disable_nesterov(!c.nesterov);
      m->set_ns_a(c.ns_a);
      m->set_ns_b(c.ns_b);
      m->set_ns_c(c.ns_c);
      m->set_ns_steps(c.ns_steps);
      m->set_eps(c.eps);
      m->set_adjust_lr(c.adjust_lr == MuonAdjustLr::kMatchRmsAdamW
                           ? v1::MUON_ADJUST_LR_MATCH_RMS_ADAMW
                           : v1::MUON_ADJUST_LR_ORIGINAL);
      break;
    }
  }
  return proto;
}

absl::StatusOr<StepStats> StepStatsFromProto(const v1::StepStats& proto) {
  StepStats stats{proto.step(), proto.sum_of_squares(), proto.found_inf(), proto.loss_scale()};
  for (const v1::TrustPartial& p : proto.trust_partials()) {
    TrustPartial partial;
    partial.tensor_index = p.tensor_index();
    partial.whole_tensor = p.whole_tensor();
    if (!partial.weight_squares.AddParts(p.weight_square_parts()) ||
        !partial.update_squares.AddParts(p.update_square_parts())) {
      return absl::InvalidArgumentError(absl::StrCat("the trust norms of tensor ", p.tensor_index(),
                                                     " have a negative or non-finite part"));
    }
    stats.trust_partials.push_back(std::move(partial));
  }
  return stats;
}

v1::StepStats StepStatsToProto(const StepStats& stats) {
  v1::StepStats proto;
  proto.set_step(stats.step);
  proto.set_sum_of_squares(stats.sum_of_squares);
  proto.set_found_inf(stats.found_inf);
  proto.set_loss_scale(stats.loss_scale);
  for (const TrustPartial& p : stats.trust_partials) {
    v1::TrustPartial* out = proto.add_trust_partials();
    out->set_tensor_index(p.tensor_index);
    out->set_whole_tensor(p.whole_tensor);
    for (double part : p.weight_squares.Parts()) out->add_weight_square_parts(part);
    for (double part : p.update_squares.Parts()) out->add_update_square_parts(part);
  }
  return proto;
}

StepDecision StepDecisionFromProto(const v1::StepDecision& proto) {
  StepDecision decision{proto.skip(), proto.clip_coef(), proto.grad_norm(), {}};
  for (const v1::TensorNorms& n : proto.tensor_norms()) {
    decision.tensor_norms.push_back(TensorNorms{n.weight_squares(), n.update_squares()});
  }
  return decision;
}

v1::StepDecision StepDecisionToProto(const StepDecision& decision) {
  v1::StepDecision proto;
  proto.set_skip(decision.skip);
  proto.set_clip_coef(decision.clip_coef);
  proto.set_grad_norm(decision.grad_norm);
  for (const TensorNorms& n : decision.tensor_norms) {
    v1::TensorNorms* out = proto.add_tensor_norms();
    out->set_weight_squares(n.weight_squares);
    out->set_update_squares(n.update_squares);
  }
  return proto;
}

absl::StatusOr<Consistency> ConsistencyFromConfig(const v1::ModelConfig& config) {
  Consistency consistency;
  switch (config.consistency()) {
    case v1::CONSISTENCY_SYNC:
      consistency = Consistency::kSync;
      break;
    case v1::CONSISTENCY_ASYNC:
      consistency = Consistency::kAsync;
      break;
    case v1::CONSISTENCY_BOUNDED:
      consistency = Consistency::kBounded;
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown consistency ", static_cast<int>(config.consistency())));
  }
  if (absl::Status s = CheckConsistency(consistency, config.staleness()); !s.ok()) {
    return s;
  }
  return consistency;
}

v1::Consistency ConsistencyToProto(Consistency consistency) {
  switch (consistency) {
    case Consistency::kSync:
      return v1::CONSISTENCY_SYNC;
    case Consistency::kAsync:
      return v1::CONSISTENCY_ASYNC;
    case Consistency::kBounded:
      return v1::CONSISTENCY_BOUNDED;
  }
  return v1::CONSISTENCY_SYNC;
}

}  // namespace shardopt
