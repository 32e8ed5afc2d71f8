// SPDX-License-Identifier: Apache-2.0
// wia-info --analyse DIR: reads the flight recorder dumps of every rank
// (wia-flight-comm<k>-rank<r>.yaml, core/src/comm/flight_recorder.hpp) and
// says, per communicator, at which collective the job stopped, which
// ranks had posted it, which never joined it (and what each of those did
// last), which ranks disagree on it, and which ranks left no dump.
#pragma once

#include <string>

namespace wia_info {

// Prints the analysis to stdout; 0 when dumps were read, 1 (with a
// message) when DIR holds none or one cannot be parsed.
int analyse_flight(const std::string& dir);

}  // namespace wia_info
