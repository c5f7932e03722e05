# Tests of leasehold-supervisor's own parts (supervisor/daemon.cmake).
leasehold_test(supervisor_config_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/config_test.cpp
               LIBS leasehold_supervisor)
leasehold_test(supervisor_heartbeat_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/heartbeat_test.cpp
               LIBS leasehold_supervisor)
leasehold_test(supervisor_control_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/control_test.cpp
               LIBS leasehold_supervisor LABELS concurrent)
