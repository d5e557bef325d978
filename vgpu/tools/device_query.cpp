// SPDX-License-Identifier: Apache-2.0
// phos-vgpu-query: prints what the Driver API reports about every device, deviceQuery-style.
//
// Every CUdevice_attribute of cuda.h is queried by name (the table is generated
// from cuda.h at build time by gen_device_attributes.py), plus each device's
// name, UUID and total memory and the driver version; `--json` prints the same
// as one JSON object. It runs on whichever libcuda.so.1 the loader finds: vgpu
// from the build tree by default, NVIDIA's driver with LD_LIBRARY_PATH.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include <cuda.h>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

namespace {

struct AttributeName {
  CUdevice_attribute attribute;
  const char* name;
  bool deprecated;
};

constexpr AttributeName kAttributes[] = {
#include "cu_device_attributes.inc"
};

std::string errorName(CUresult r) {
  const char* name = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS || name == nullptr) return "unknown CUresult";
  return name;
}

[[noreturn]] void fail(const char* what, CUresult r) {
  std::fprintf(stderr, "phos-vgpu-query: %s failed: %s (%d)\n", what, errorName(r).c_str(),
               static_cast<int>(r));
  std::exit(1);
}

#define CHECK(call)                            \
  do {                                         \
    CUresult r_ = (call);                      \
    if (r_ != CUDA_SUCCESS) fail(#call, r_);   \
  } while (0)

// nvidia-smi's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx.
std::string uuidText(const CUuuid& uuid) {
  std::string text = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) text += '-';
    char hex[3];
    std::snprintf(hex, sizeof hex, "%02x", static_cast<unsigned char>(uuid.bytes[i]));
    text += hex;
  }
  return text;
}

struct AttributeValue {
  const AttributeName* attribute;
  CUresult status;
  int value;
};

struct DeviceReport {
  int ordinal;
  std::string name;
  std::string uuid;
  size_t totalMemory;
  std::vector<AttributeValue> attributes;
};

DeviceReport queryDevice(int ordinal) {
  CUdevice device;
  CHECK(cuDeviceGet(&device, ordinal));
  DeviceReport report{ordinal, {}, {}, 0, {}};
  char name[256] = {};
  CHECK(cuDeviceGetName(name, sizeof name, device));
  report.name = name;
  CUuuid uuid;
  CHECK(cuDeviceGetUuid(&uuid, device));
  report.uuid = uuidText(uuid);
  CHECK(cuDeviceTotalMem(&report.totalMemory, device));
  // An attribute the driver does not know is reported with its error instead
  // of ending the query: a newer cuda.h than the driver is legitimate.
  for (const AttributeName& a : kAttributes) {
    int value = 0;
    CUresult r = cuDeviceGetAttribute(&value, a.attribute, device);
    report.attributes.push_back({&a, r, value});
  }
  return report;
}

void printText(int driverVersion, const std::vector<DeviceReport>& devices) {
  std::printf("Driver version: %d.%d (%d)\n", driverVersion / 1000, driverVersion % 1000 / 10,
              driverVersion);
  std::printf("Devices: %zu\n", devices.size());
  for (const DeviceReport& d : devices) {
    std::printf("\nDevice %d: %s\n", d.ordinal, d.name.c_str());
    std::printf("  UUID: %s\n", d.uuid.c_str());
    std::printf("  Total memory: %zu bytes (%.1f GiB)\n", d.totalMemory,
                static_cast<double>(d.totalMemory) / (1ull << 30));
    std::printf("  Attributes:\n");
    for (const AttributeValue& v : d.attributes) {
      std::string value = v.status == CUDA_SUCCESS ? std::to_string(v.value) : "error " + errorName(v.status);
      std::printf("    %-66s %s%s\n", v.attribute->name, value.c_str(),
                  v.attribute->deprecated ? "  (deprecated)" : "");
    }
  }
}

void printJson(int driverVersion, const std::vector<DeviceReport>& devices) {
  nlohmann::ordered_json out;
  out["driver_version"] = driverVersion;
  out["device_count"] = devices.size();
  out["devices"] = nlohmann::ordered_json::array();
  for (const DeviceReport& d : devices) {
    nlohmann::ordered_json device;
    device["ordinal"] = d.ordinal;
    device["name"] = d.name;
    device["uuid"] = d.uuid;
    device["total_memory"] = d.totalMemory;
    // Keyed by enumerator name; an attribute the driver refused is null, its
    // error under "attribute_errors".
    nlohmann::ordered_json attributes = nlohmann::ordered_json::object();
    nlohmann::ordered_json errors = nlohmann::ordered_json::object();
    for (const AttributeValue& v : d.attributes) {
      if (v.status == CUDA_SUCCESS) {
        attributes[v.attribute->name] = v.value;
      } else {
        attributes[v.attribute->name] = nullptr;
        errors[v.attribute->name] = errorName(v.status);
      }
    }
    device["attributes"] = std::move(attributes);
    device["attribute_errors"] = std::move(errors);
    out["devices"].push_back(std::move(device));
  }
  std::printf("%s\n", out.dump(2).c_str());
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Print every CUdevice_attribute, name, UUID and memory of every CUDA device"};
  bool json = false;
  app.add_flag("--json", json, "print one JSON object instead of text");
  CLI11_PARSE(app, argc, argv);

  int driverVersion = 0;
  CHECK(cuDriverGetVersion(&driverVersion));
  std::vector<DeviceReport> devices;
  // "CUDA_ERROR_NO_DEVICE: no CUDA-capable devices were detected" is an answer
  // to the query, not a failure of it.
  CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS && init != CUDA_ERROR_NO_DEVICE) fail("cuInit(0)", init);
  if (init == CUDA_SUCCESS) {
    int count = 0;
    CHECK(cuDeviceGetCount(&count));
    for (int i = 0; i < count; ++i) devices.push_back(queryDevice(i));
  }
  if (json) {
    printJson(driverVersion, devices);
  } else {
    printText(driverVersion, devices);
  }
  return 0;
}
