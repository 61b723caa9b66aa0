// A vector of trivially copyable values that keeps up to N of them inline (no heap for small shapes).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <type_traits>

namespace flowlet {

template <class T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>, "SmallVector holds trivially copyable values");

 public:
  SmallVector() = default;
  SmallVector(size_t count, T value) { resize(count, value); }
  SmallVector(std::initializer_list<T> values) { assign(values.begin(), values.size()); }
  template <class It>
  SmallVector(It first, It last) {
    for (; first != last; ++first) push_back(static_cast<T>(*first));
  }
  SmallVector(const SmallVector& other) { assign(other.data(), other.size_); }
  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) {
      size_ = 0;
      assign(other.data(), other.size_);
    }
    return *this;
  }
  ~SmallVector() = default;

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return heap_ ? heap_.get() : inline_; }
  const T* data() const { return heap_ ? heap_.get() : inline_; }
  T& operator[](size_t i) { return data()[i]; }
  const T& operator[](size_t i) const { return data()[i]; }
  T* begin() { return data(); }
  T* end() { return data() + size_; }
  const T* begin() const { return data(); }
  const T* end() const { return data() + size_; }
  T& back() { return data()[size_ - 1]; }
  const T& back() const { return data()[size_ - 1]; }

  void push_back(T value) {
    reserve(size_ + 1);
    data()[size_++] = value;
  }
  void pop_back() { --size_; }
  void clear() { size_ = 0; }
  void resize(size_t count, T value = T{}) {
    reserve(count);
    for (size_t i = size_; i < count; ++i) data()[i] = value;
    size_ = count;
  }
  void insert(size_t position, T value) {
    reserve(size_ + 1);
    T* d = data();
    std::memmove(d + position + 1, d + position, (size_ - position) * sizeof(T));
    d[position] = value;
    ++size_;
  }
  void erase(size_t position) {
    T* d = data();
    std::memmove(d + position, d + position + 1, (size_ - position - 1) * sizeof(T));
    --size_;
  }
  void reserve(size_t count) {
    if (count <= capacity_) return;
    size_t grown = std::max(count, capacity_ * 2);
    auto bigger = std::make_unique<T[]>(grown);
    std::memcpy(bigger.get(), data(), size_ * sizeof(T));
    heap_ = std::move(bigger);
    capacity_ = grown;
  }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }

 private:
  void assign(const T* values, size_t count) {
    reserve(count);
    std::memcpy(data(), values, count * sizeof(T));
    size_ = count;
  }

  T inline_[N];  // uninitialized: only the first size_ entries are ever read
  std::unique_ptr<T[]> heap_;
  size_t size_ = 0;
  size_t capacity_ = N;
};

}  // namespace flowlet
