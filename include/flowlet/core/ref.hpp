// Ref<T>: an intrusive reference-counted pointer (one atomic count inside the object, no control block).
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>

namespace flowlet {

// Base for objects owned through Ref<T>. The count starts at zero; Ref takes the first reference.
class RefCounted {
 public:
  RefCounted() = default;
  RefCounted(const RefCounted&) = delete;
  RefCounted& operator=(const RefCounted&) = delete;

  void retain() const { refs_.fetch_add(1, std::memory_order_relaxed); }
  // True when this call released the last reference.
  bool release() const { return refs_.fetch_sub(1, std::memory_order_acq_rel) == 1; }
  int32_t use_count() const { return refs_.load(std::memory_order_relaxed); }

 protected:
  ~RefCounted() = default;

 private:
  mutable std::atomic<int32_t> refs_{0};
};

template <class T>
class Ref {
 public:
  Ref() = default;
  explicit Ref(T* object) : object_(object) {
    if (object_) object_->retain();
  }
  Ref(const Ref& other) : object_(other.object_) {
    if (object_) object_->retain();
  }
  Ref(Ref&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Ref& operator=(Ref other) noexcept {
    std::swap(object_, other.object_);
    return *this;
  }
  ~Ref() {
    if (object_ && object_->release()) delete object_;
  }

  T* get() const { return object_; }
  T* operator->() const { return object_; }
  T& operator*() const { return *object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  T* object_ = nullptr;
};

template <class T, class... Args>
Ref<T> make_ref(Args&&... args) {
  return Ref<T>(new T(std::forward<Args>(args)...));
}

}  // namespace flowlet
